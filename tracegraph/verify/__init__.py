"""Verify a fix: metrics of an analysis, before/after diff, checks for a CI gate."""
