"""The test suites, and the test kit (tests.harness) that tests, bench/ and tools/ import."""
