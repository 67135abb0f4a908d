"""The toolops executor: services, scheduling, Celery tasks, commands and the embedded runner."""
