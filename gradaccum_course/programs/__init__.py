"""The programs a notebook runs under torchrun: ``python -m gradaccum_course.programs.NAME``."""
