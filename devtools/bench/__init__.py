"""`pkgq bench`: the standard scenario through real processes, against baselines."""
