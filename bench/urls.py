"""No URLs: the benchmark serves nothing (section 13 renders templates that reverse)."""

urlpatterns: list[object] = []
