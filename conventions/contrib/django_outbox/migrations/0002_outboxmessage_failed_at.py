# Written as makemigrations would, then formatted by ruff: the relay's dead-letter mark.

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("django_outbox", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="outboxmessage",
            name="failed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
