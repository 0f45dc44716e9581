"""What every page of the outbox admin shares: nothing is added, edited or deleted.

The change permission only unlocks the operators' actions, which go through
:mod:`django_domain_events.operations`.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest


class ViewOnlyChangeList(ChangeList):
    """The changelist of a model nobody edits here: it selects rows to view."""

    def __init__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> None:
        super().__init__(request, *args, **kwargs)
        if not self.is_popup:
            self.title = f"Select {self.opts.verbose_name} to view"


class ReadOnly:
    """Never add, edit or delete; the change permission only unlocks the actions.

    ``has_change_permission`` answers the real permission for the model as a whole
    (what the actions ask), and ``False`` for any one row, which opens each row's page
    in Django's view-only mode: every field read-only, no save buttons, and a POST
    refused.
    """

    opts: Any

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None:
            return False
        codename = f"{self.opts.app_label}.change_{self.opts.model_name}"
        return bool(request.user.has_perm(codename))

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        # The index and app pages then offer "View", not "Change".
        perms: dict[str, bool] = super().get_model_perms(request)  # type: ignore[misc]
        return {**perms, "add": False, "change": False, "delete": False}

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        declared = list(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        fields = [f.name for f in self.opts.concrete_fields]
        return declared + [f for f in fields if f not in declared]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ViewOnlyChangeList
