"""Benchmarks of django-domain-events: ``make bench`` runs ``bench/run.py``."""
