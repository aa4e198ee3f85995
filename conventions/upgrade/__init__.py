"""``conventions migrate``: the steps that move stored data from one format version to
the next, and the machinery that runs them.

* :mod:`conventions.upgrade.steps`: a step (its place, its format, the version it moves
  to, what it would change and what it does) and the registry of them.
* :mod:`conventions.upgrade.places`: where the layer keeps data (the store on Redis or
  SQL, the transport's Redis) and each place's stamp (:mod:`conventions.store.stamps`).
* :mod:`conventions.upgrade.redis_store`, :mod:`~conventions.upgrade.sql_store`,
  :mod:`~conventions.upgrade.transport`: the steps of each kind of place, one module each.
* :mod:`conventions.upgrade.runner`: the plan (from each place's stamped version to this
  release's, :mod:`conventions.config.formats`), a dry run, and ``--apply``: under the
  place's lock, each step in order, its progress in the stamp, an audit event per step.

A step is idempotent (run twice, it changes nothing the second time) and may record its
own progress (a cursor) so that a migrate killed inside it resumes where it was.
"""
