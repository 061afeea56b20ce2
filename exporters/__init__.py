"""Live exports for monitoring systems: `ckptrace serve` and its Prometheus series."""
