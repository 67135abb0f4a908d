"""Executor services: each public function is one use case, called by a thin command, task or view."""
