# restic (Debian 12: 0.14.0) is the baseline of the ingest benchmark
# (engine/content BenchmarkIngest) and of the big-repository benchmarks
# (engine BenchmarkScaleBigRepoCreate, cmd/turnsnap BenchmarkScaleBigRepoTurns):
# `restic backup` of the same data into a local repository in the same run.
# zstd is the big-repository benchmark's other baseline (`tar | zstd -T0`).
# Only benchmarks use them.
apt_need restic restic
apt_need zstd zstd
