"""Task environments: the image a task's ``environment/Dockerfile`` describes, built with
Docker (:mod:`stayer.sandbox.docker`) or without it, over a Debian root filesystem
(:mod:`stayer.environments.base`) with each step run in bubblewrap
(:mod:`stayer.environments.build`). :mod:`stayer.environments.dockerfile` reads the file."""
