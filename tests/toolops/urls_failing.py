"""A URLconf with one view that fails, for the middleware's error logging test."""

from django.http import HttpRequest, HttpResponse
from django.urls import path


def failing_view(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("backend at http://ops:hunter2-pw@db.internal/?token=tok-secret-9 failed")


urlpatterns = [path("boom/", failing_view)]
