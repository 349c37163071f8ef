"""scoring: the metrics' arithmetic (error rates, intervals, the TTA rule, targets), pure functions of numbers."""
