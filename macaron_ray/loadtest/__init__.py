"""`macaron loadtest`: multi-turn, mixed-domain load through the official SDKs, timed per hop."""
