"""What runs and when: the dataset's rows as the runner holds them, the plan of what is left, the
engine's workers, rollouts per prompt, the budget and the prices it needs."""
