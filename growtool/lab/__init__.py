"""Research operators used by the benchmarks: learned growth, token-level model comparison."""
