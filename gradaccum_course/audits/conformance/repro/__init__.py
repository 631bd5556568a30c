"""One small program per deviating cause of the conformance table: each runs the framework's
path on its scenario, prints the update's norm ratio to the large batch's, next to a plain
PyTorch loop that explains it, and exits 1 if the deviation is gone or has changed (a version
bump that fixes it is then noticed). Run: ``python -m
gradaccum_course.audits.conformance.repro.NAME``; ``_common`` holds what they share."""
