"""TokenSpeed's C++ scheduler (PyPI ``tokenspeed-scheduler``) driven as a kvcheck target."""
