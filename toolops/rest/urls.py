"""`/api/...` routes, the OpenAPI schema at /api/schema/ and its docs pages."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny
from rest_framework.routers import DefaultRouter

from toolops.rest import views

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("operations", views.OperationViewSet, basename="operation")
router.register("input-requests", views.InputRequestViewSet, basename="input-request")
router.register("reconciliation", views.ReconciliationViewSet, basename="reconciliation")
router.register("servers", views.ServerViewSet, basename="server")

# The schema describes the API's shape, not anyone's data: readable without a tenant.
urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(permission_classes=[AllowAny]), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema", permission_classes=[AllowAny]),
         name="api-docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api-schema", permission_classes=[AllowAny]),
         name="api-redoc"),
    path("", include(router.urls)),
]
