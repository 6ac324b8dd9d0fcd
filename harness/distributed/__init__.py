"""Several load generators acting as one run: Ray actors driven from one process
(`harness run --workers N`), and the same seam by hand (`--shard i/n --start-at T`,
`harness merge`)."""
