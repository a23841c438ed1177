"""Target ``reference``: kvcheck's own model of each variant (``caches/<variant>.py`` driven by
``caches/subjects/<variant>.py``), with the catalogued faults (``caches/faults/``) injectable."""
