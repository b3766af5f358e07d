"""Reliability harnesses: the chaos runner, the kill -9 accounting, the store auditor."""
