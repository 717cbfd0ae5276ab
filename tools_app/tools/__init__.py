"""Built-in tools; importing this package registers each of them."""
from . import bash, files, mcp_bridge, run_python, web_fetch  # noqa: F401
