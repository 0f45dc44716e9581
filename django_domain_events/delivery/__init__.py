"""Delivery, in the order one row travels: claiming owed rows under a lease (claim,
lease), running one attempt and recording how it ended (run, outcomes), a pass over the
lanes (passes), several rows at once (pool), the long-running relay (relay) and what it
rides out (outage), waking relays (wake) and task hand-off (tasks)."""
