"""Admin test clients: a logged-in staff user with the given permissions, or a superuser."""

from __future__ import annotations

from django.contrib.auth.models import Permission, User
from django.test import Client


def staff_client(*perms: str, superuser: bool = False) -> tuple[Client, User]:
    if superuser:
        user = User.objects.create_superuser("root", "root@example.com", "pw")
    else:
        user = User.objects.create_user("staff", "staff@example.com", "pw", is_staff=True)
        user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    client = Client()
    client.force_login(user)
    return client, user
