"""The REST API (Django REST framework). Views are thin: each calls one function of toolops.python_api
(the Python embedding API)."""
