"""Accuracy: does a serving configuration still answer correctly?

Two measures, both against a running OpenAI-compatible endpoint:

- a **task score** (:mod:`perflab.accuracy.harness`): lm-evaluation-harness scores the endpoint
  on a task by name (the shipped offline ``perflab_arith``, or any lm-eval task such as gsm8k
  where its data is available) — needs the ``perflab[accuracy]`` extra;
- **agreement** (:mod:`perflab.accuracy.agreement`): greedy answers to a fixed prompt set
  compared with the baseline's, judged against the noise floor of the baseline measured twice
  under different load — needs nothing beyond perflab.

The records they return are :mod:`perflab.accuracy.types`.
"""
