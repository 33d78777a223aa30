"""The programs that run in the small pods around a run on the cluster -- not the run itself, which is
:mod:`dapo.train` in the RayJob's driver:

- ``python -m dapo.cluster.follow`` (:mod:`dapo.cluster.follow`), the log follower Job's program
  (``kubectl logs -f job/<release>-train-logs``): every attempt's driver log as one stream until the run ends, which
  it reads from the RayJob's status (:mod:`~dapo.cluster.rayjob_api`), and from its pods and events why the run
  waits before a driver log exists and what disrupts it after (:mod:`~dapo.cluster.waits`);
  Between attempts it acts (:mod:`~dapo.cluster.keeper`): answers each attempt's end record, leaves the nodes a
  failure names out of the next attempt (:mod:`~dapo.cluster.nodes`), holds the run to its failure budget
  (:mod:`~dapo.cluster.budget`), ends an attempt whose driver froze;
- ``python -m dapo.cluster.evidence`` (:mod:`~dapo.cluster.evidence`), the preStop hook of the training RayJob's Ray
  pods: their logs copied to the run's volume before KubeRay deletes them;
- ``python -m dapo.cluster.gpu_check`` (:mod:`~dapo.cluster.gpu_check`), the GPU pods' driver check (a postStart hook
  of every GPU worker, the ``helm test`` GPU pod);
- ``python -m dapo.cluster.preflight`` (:mod:`~dapo.cluster.preflight`), the preflight Job's checks before any RayJob
  holds a GPU: the node's driver, the claim (ReadWriteMany, writable by the image's user, fast enough for the preset's
  checkpoints);
- ``python -m dapo.cluster.start_guard`` (:mod:`~dapo.cluster.start_guard`), the start guard Job's program: without a
  gang scheduler, a RayJob whose first attempt failed before it ran is deleted instead of retried as it was.

Every module here runs in whichever image the pod runs -- the training image, the evaluation image, the
reproduction image (Python 3.10, our package without extras) -- so they use the standard library only (the GPU
check imports torch lazily, for ``--torch``). Imports :mod:`dapo.train.runlog` (the attempt logs' format) and
:mod:`dapo.train.attempts` (the end records, progress and verdict an attempt leaves); the chart
names these programs in its pods' commands. Importing the package
imports nothing.
"""
