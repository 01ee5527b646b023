"""Scale-out: the scheduler (priorities, fair share in dollars, over-provisioning), the Ray
backend, and rollouts for training with their exports. Nothing below imports this package."""
