"""The sweep concern, shared by the local sweep (`sexpgpu sweep`) and the Ray driver
(orchestration/driver.py): what a defsweep searches (search.py: sampled points, the
:halving option), the schedulers that decide which points go on (schedulers.py: synchronous
halving, ASHA, median stopping, and the decisions they store), the synchronous halving's
stages (halving.py), the ledger of a sweep's points (ledger.py) and the local side-by-side
workers (jobs.py)."""
