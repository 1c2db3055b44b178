"""rdmasched beside real work: OS-enforced preemption (`freeze`). See docs/PREEMPTION.md."""
