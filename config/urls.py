from django.contrib import admin
from django.urls import include, path

from toolops.metrics_view import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("toolops.rest.urls")),
    path("metrics", metrics_view, name="metrics"),
]
