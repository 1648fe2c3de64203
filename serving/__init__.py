"""The serving app: the OpenAI-compatible HTTP API, the admin API, the daemon that composes engine,
telemetry and tuner, the command line, and the tuning report ops teams export."""
