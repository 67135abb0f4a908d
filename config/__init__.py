"""Django project and Celery app for toolops.

Importing the Celery app here makes `shared_task` bind to it whenever Django starts.
"""

from config.celery import app as celery_app

__all__ = ("celery_app",)
