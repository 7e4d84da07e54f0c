"""``seal doctor``: the machine facts a bug report or a GPU run needs, and the GPU check.

* :mod:`~seal_rl.doctor.facts` — what ``seal doctor`` prints: the CPU and whether it computes
  bfloat16 natively, the GPUs, the versions that matter, the installed extras, the pulled models
  and their hashes, BFCL's and τ²'s versions. Nothing is loaded or downloaded.
* :mod:`~seal_rl.doctor.gpu_check` — ``seal doctor --gpu``: what a short GPU window has to prove,
  each check in a process of its own with its own timeout; :mod:`~seal_rl.doctor.check_figures`
  reads and summarises each check's figures, :mod:`~seal_rl.doctor.probes` and
  :mod:`~seal_rl.doctor.server_round` are the checks that run as processes of their own, and
  :mod:`~seal_rl.doctor.oracle` is the generator of the training-round check.
"""
