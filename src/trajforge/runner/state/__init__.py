"""A run's bookkeeping on disk: the batch files' writer and reader (store), the checkpoint (its
snapshot, journal and finished index), what a killed invocation left (recovery), the dataset pass
it keeps (rowcache), sample keys, and the run directory's lock (rundir)."""
