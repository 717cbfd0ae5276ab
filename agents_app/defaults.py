"""The default agents: the seed-004 trio and the seed-000 analyst.

Loaded by a data migration and by ``manage.py load_default_agents`` (both idempotent: an agent
that exists is left as the admin edited it). The trio runs on ``ollama``, as seed 004 says; the
router sends their runs to ``mock`` while no Ollama answers at ``OLLAMA_URL`` (a cached probe),
so a fresh install works offline and one with Ollama gets real answers without editing agents.
The analyst runs on ``claude`` and falls back to ``mock`` without an API key.
"""
from __future__ import annotations

ORCHESTRATOR_PROMPT = """You are the Orchestrator AI.
You coordinate tools (local + MCP) and specialist agents.
You ALWAYS respond ONLY in JSON with this schema:

{
  "thought": "short reasoning in English",
  "action": "use_tool | delegate | final",
  "tool": "tool_name or null",
  "target_agent": "agent_name or null",
  "args": {},
  "answer": "final user-facing answer or empty if not final"
}

Available tools:
- read_file(path: str) - Read file contents
- write_file(path: str, content: str) - Write to file
- run_python(code: str) - Execute Python code
- mcp_filesystem(tool: str, args: dict) - MCP filesystem operations
- mcp_trader(tool: str, args: dict) - MCP trading operations

Available agents:
- coder: Python/Node.js/Next.js/trading code expert
- researcher: Information analysis and structuring

Actions:
- use_tool: Call a tool and await result
- delegate: Hand off subtask to specialist agent
- final: Provide final answer to user
"""

CODER_PROMPT = """You are CoderAgent, an expert in:
- Python, Node.js, Next.js
- Trading automation and algorithms
- Code refactoring and debugging

You help write, refactor, and debug code.
Always respond in JSON: {thought, action, tool, target_agent, args, answer}.

When you need to:
- Read/write files: use read_file or write_file tools
- Test code: use run_python tool
- Complete task: action="final" with answer
"""

RESEARCHER_PROMPT = """You are ResearchAgent.
You analyze, summarize, and structure information for the user.

Always respond in JSON: {thought, action, tool, target_agent, args, answer}.

When you need to:
- Read documents: use read_file tool
- Analyze data: use run_python tool
- Complete task: action="final" with answer
"""

ANALYST_PROMPT = """You are 研发效能分析师 (R&D efficiency analyst).
You analyse engineering data in your workspace (delivery metrics, CI logs, repository history)
and explain bottlenecks with evidence. Use the tools to read and compute; write reports to
files when asked. Answer in the user's language, concisely, citing the files you used.
"""

_TRIO_TOOLS = ["read_file", "write_file", "run_python", "mcp_filesystem", "mcp_trader"]


def default_agents() -> list[dict]:
    trio_engine = "ollama"
    return [
        dict(role="orchestrator", display_name="Orchestrator", name_zh="总调度",
             description="Coordinates tools and specialist agents (seed 004).",
             system_prompt=ORCHESTRATOR_PROMPT, engine=trio_engine, allowed_tools=_TRIO_TOOLS, max_steps=10),
        dict(role="coder", display_name="Coder", name_zh="编程专家",
             description="Python/Node.js/Next.js/trading code expert.",
             system_prompt=CODER_PROMPT, engine=trio_engine, allowed_tools=_TRIO_TOOLS, max_steps=10),
        dict(role="researcher", display_name="Researcher", name_zh="研究员",
             description="Information analysis and structuring.",
             system_prompt=RESEARCHER_PROMPT, engine=trio_engine, allowed_tools=_TRIO_TOOLS, max_steps=10),
        dict(role="dev_efficiency_analyst", display_name="R&D Efficiency Analyst", name_zh="研发效能分析师",
             description="Analyses engineering efficiency data in its workspace (seed 000).",
             system_prompt=ANALYST_PROMPT, engine="claude",
             allowed_tools=["bash", "read_file", "write_file", "web_fetch"], max_steps=20),
    ]


def load_default_agents(agent_model=None) -> list[str]:
    """Create the default agents that do not exist yet; returns the roles created."""
    if agent_model is None:
        from .models import Agent as agent_model
    created = []
    for spec in default_agents():
        _, was_created = agent_model.objects.get_or_create(role=spec["role"], defaults=spec)
        if was_created:
            created.append(spec["role"])
    return created
