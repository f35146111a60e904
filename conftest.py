# Shared fixtures on real infrastructure (nats-server, PostgreSQL): see prorsa_runtime/testing.py
pytest_plugins = ["prorsa_runtime.testing"]
