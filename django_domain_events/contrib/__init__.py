"""Task-queue back ends for receivers declared with ``site="task"``.

Each lives in its own module and imports its queue library only when that module is
imported, so ``django_domain_events`` itself never needs Celery or django-tasks:

- ``django_domain_events.contrib.celery.CeleryBackend`` (``pip install
  'django-domain-outbox[celery]'``);
- ``django_domain_events.contrib.django_tasks.DjangoTasksBackend`` (``django.tasks`` on
  Django 6; ``pip install 'django-domain-outbox[tasks]'`` for the backport on Django 5.2).
"""
