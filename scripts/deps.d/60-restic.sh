# restic (Debian 12: 0.14.0) is the baseline of the ingest benchmark
# (engine/content BenchmarkIngest): `restic backup` of the same data into a
# local repository in the same run. Only benchmarks use it.
apt_need restic restic
