"""The batch job: planning, scheduling, durable output, checkpoint/resume, filters, statistics."""
