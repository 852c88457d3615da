"""What this machine is: CPU, RAM, disks, network interfaces, GPUs (NVML) and MPI, without side effects.

Each probe returns plain data and never raises for missing hardware: a machine
without GPUs, without NVML or without MPI gets an answer that says so.
"""
