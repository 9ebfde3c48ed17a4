"""The test project's one page: something for Django itself to answer beside the dashboard."""

from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("hello/", lambda request: HttpResponse("hello from django"))]
