"""Loading: find a bundle's rank profiles, parse them (in parallel, cached), merge groups."""
