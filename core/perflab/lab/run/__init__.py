"""Running a study: the runner, the executor of one configuration, and the backends below them."""
