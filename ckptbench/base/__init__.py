"""What every stage stands on, knowing nothing of a point: the errors a command reports and their exit
statuses, the host a run happened on, opening a file a run reads, and the test a figure read back passes."""
