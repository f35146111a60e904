"""Adapters for RL frameworks whose code Prorsa plugs into: :mod:`prorsa_sdk.integrations.verl`.

Each adapter imports its framework only when used, so ``prorsa_sdk`` installs and imports
without any framework (see docs/integrations.md)."""
