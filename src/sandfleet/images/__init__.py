"""Building environment images without a Docker engine: the Dockerfile front end, bases
(debootstrap, language images), the step runner and the layer writer. What gets built is a
:class:`sandfleet.images.spec.BuildSpec` (a Dockerfile, its context, a name): the builder
knows no task (``sandfleet.tasks.images`` makes the spec of a task). Built images go into the
store, :mod:`sandfleet.imagestore`.
"""
