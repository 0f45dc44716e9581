"""Delivery: claiming owed rows (claim), running one attempt and recording it (run, outcomes),
the passes and the relay loop (relay), waking relays (wake) and task hand-off (tasks)."""
