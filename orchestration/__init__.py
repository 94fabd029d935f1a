"""The Ray driver: sweep fan-out, bundle submission, retry and resume of preempted points."""
