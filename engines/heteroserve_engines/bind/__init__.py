"""`heteroserve-bind`: the decode engine's CPU binding, computed inside the container from the
cpuset the kubelet granted it, then the engine exec'd with the seeds' variables.

The operator can plan how many CPUs a decode engine binds on how many NUMA nodes, but not which:
under the kubelet's static CPU manager the kubelet chooses a container's exclusive cpuset, and two
replicas on one node must not bind the same cores. So the pod asks for the count and this
entrypoint, running in the container, reads what it got and binds that.

- `plan`: pure. Granted CPUs and the node's topology in, the binding (or the rule it breaks) out.
- `grant`: the I/O. `sched_getaffinity`, the cgroup cpuset (v2 `cpuset.cpus.effective`, v1
  `cpuset.cpus`) of the process's own cgroup, the NUMA nodes and SMT siblings from /sys; every root
  is a parameter so tests point them at fake trees.
- `__main__`: the command line, the termination message and the exec.

Standard library and `protocol.binding` only: the entrypoint must start before anything heavy and
could run from a zipapp in a foreign engine's image that has a Python.
"""
