"""Requests, the scheduler and its error budget."""
