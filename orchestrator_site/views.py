"""JSON error handlers for paths Django answers itself."""
from django.http import JsonResponse


def not_found(request, exception=None):
    return JsonResponse({"code": "not_found", "message": f"No endpoint at {request.path}."}, status=404)


def server_error(request):
    return JsonResponse({"code": "internal_error", "message": "Internal server error."}, status=500)
