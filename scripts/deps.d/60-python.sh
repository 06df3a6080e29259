# The Python client's tests (clients/python) run under Debian's pytest
# against a real daemon: standard library only, so pytest is all they need.
apt_need pytest-3 python3-pytest
