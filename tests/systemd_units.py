"""A reader of systemd unit files strict enough to catch what systemd would ignore with a warning.

systemd allows a comment only on a line of its own: ``Delegate=yes  # why`` sets Delegate to
"yes  # why", which it rejects ("Invalid controller name 'yes'") and then *ignores*, so the unit
runs with the default it meant to change. ``systemd-analyze verify`` says so where systemd is
installed (tests/system/agent/test_deploy_units.py runs it there); this reader says the same where it is not:
a comment after a value, a key that is not one of its section's, a line outside any section.

``KNOWN`` lists every key systemd 252 (Debian 12) accepts in [Unit], [Service] and [Install]
(systemd.unit(5), systemd.service(5), systemd.exec(5), systemd.kill(5),
systemd.resource-control(5)), read from the key table systemd 252 itself parses units with.
A key a later systemd added is "unknown" here, as it would be on Debian 12.
"""

from __future__ import annotations

import re
import textwrap

KNOWN: dict[str, frozenset[str]] = {
    "Unit": frozenset("""
    After AllowIsolate AssertACPower AssertArchitecture AssertCPUFeature AssertCPUPressure AssertCPUs
    AssertCapability AssertControlGroupController AssertCredential AssertDirectoryNotEmpty
    AssertEnvironment AssertFileIsExecutable AssertFileNotEmpty AssertFirstBoot AssertGroup AssertHost
    AssertIOPressure AssertKernelCommandLine AssertKernelVersion AssertMemory AssertMemoryPressure
    AssertNeedsUpdate AssertOSRelease AssertPathExists AssertPathExistsGlob AssertPathIsDirectory
    AssertPathIsEncrypted AssertPathIsMountPoint AssertPathIsReadWrite AssertPathIsSymbolicLink
    AssertSecurity AssertUser AssertVirtualization Before BindTo BindsTo CollectMode ConditionACPower
    ConditionArchitecture ConditionCPUFeature ConditionCPUPressure ConditionCPUs ConditionCapability
    ConditionControlGroupController ConditionCredential ConditionDirectoryNotEmpty ConditionEnvironment
    ConditionFileIsExecutable ConditionFileNotEmpty ConditionFirmware ConditionFirstBoot ConditionGroup
    ConditionHost ConditionIOPressure ConditionKernelCommandLine ConditionKernelVersion ConditionMemory
    ConditionMemoryPressure ConditionNeedsUpdate ConditionOSRelease ConditionPathExists
    ConditionPathExistsGlob ConditionPathIsDirectory ConditionPathIsEncrypted ConditionPathIsMountPoint
    ConditionPathIsReadWrite ConditionPathIsSymbolicLink ConditionSecurity ConditionUser
    ConditionVirtualization Conflicts DefaultDependencies Description Documentation FailureAction
    FailureActionExitStatus IgnoreOnIsolate IgnoreOnSnapshot JobRunningTimeoutSec JobTimeoutAction
    JobTimeoutRebootArgument JobTimeoutSec JoinsNamespaceOf OnFailure OnFailureIsolate OnFailureJobMode
    OnSuccess OnSuccessJobMode PartOf PropagateReloadFrom PropagateReloadTo PropagatesReloadTo
    PropagatesStopTo RebootArgument RefuseManualStart RefuseManualStop ReloadPropagatedFrom Requires
    RequiresMountsFor RequiresOverridable Requisite RequisiteOverridable SourcePath StartLimitAction
    StartLimitBurst StartLimitInterval StartLimitIntervalSec StopPropagatedFrom StopWhenUnneeded
    SuccessAction SuccessActionExitStatus Upholds Wants
    """.split()),
    "Service": frozenset("""
    AllowedCPUs AllowedMemoryNodes AmbientCapabilities AppArmorProfile BPFProgram BindPaths
    BindReadOnlyPaths BlockIOAccounting BlockIODeviceWeight BlockIOReadBandwidth BlockIOWeight
    BlockIOWriteBandwidth BusName BusPolicy CPUAccounting CPUAffinity CPUQuota CPUQuotaPeriodSec
    CPUSchedulingPolicy CPUSchedulingPriority CPUSchedulingResetOnFork CPUShares CPUWeight
    CacheDirectory CacheDirectoryMode Capabilities CapabilityBoundingSet ConfigurationDirectory
    ConfigurationDirectoryMode CoredumpFilter DefaultMemoryLow DefaultMemoryMin Delegate DeviceAllow
    DevicePolicy DisableControllers DynamicUser Environment EnvironmentFile ExecCondition ExecPaths
    ExecReload ExecSearchPath ExecStart ExecStartPost ExecStartPre ExecStop ExecStopPost ExitType
    ExtensionDirectories ExtensionImages FailureAction FileDescriptorStoreMax FinalKillSignal Group
    GuessMainPID IOAccounting IODeviceLatencyTargetSec IODeviceWeight IOReadBandwidthMax IOReadIOPSMax
    IOSchedulingClass IOSchedulingPriority IOWeight IOWriteBandwidthMax IOWriteIOPSMax IPAccounting
    IPAddressAllow IPAddressDeny IPCNamespacePath IPEgressFilterPath IPIngressFilterPath IgnoreSIGPIPE
    InaccessibleDirectories InaccessiblePaths KeyringMode KillMode KillSignal LimitAS LimitCORE LimitCPU
    LimitDATA LimitFSIZE LimitLOCKS LimitMEMLOCK LimitMSGQUEUE LimitNICE LimitNOFILE LimitNPROC LimitRSS
    LimitRTPRIO LimitRTTIME LimitSIGPENDING LimitSTACK LoadCredential LoadCredentialEncrypted
    LockPersonality LogExtraFields LogLevelMax LogNamespace LogRateLimitBurst LogRateLimitIntervalSec
    LogsDirectory LogsDirectoryMode ManagedOOMMemoryPressure ManagedOOMMemoryPressureLimit
    ManagedOOMPreference ManagedOOMSwap MemoryAccounting MemoryDenyWriteExecute MemoryHigh MemoryLimit
    MemoryLow MemoryMax MemoryMin MemorySwapMax MountAPIVFS MountFlags MountImages NUMAMask NUMAPolicy
    NetClass NetworkNamespacePath Nice NoExecPaths NoNewPrivileges NonBlocking NotifyAccess OOMPolicy
    OOMScoreAdjust PAMName PIDFile PassEnvironment PermissionsStartOnly Personality PrivateDevices
    PrivateIPC PrivateMounts PrivateNetwork PrivateTmp PrivateUsers ProcSubset ProtectClock
    ProtectControlGroups ProtectHome ProtectHostname ProtectKernelLogs ProtectKernelModules
    ProtectKernelTunables ProtectProc ProtectSystem ReadOnlyDirectories ReadOnlyPaths
    ReadWriteDirectories ReadWritePaths RebootArgument RemainAfterExit RemoveIPC Restart
    RestartForceExitStatus RestartKillSignal RestartPreventExitStatus RestartSec RestrictAddressFamilies
    RestrictFileSystems RestrictNamespaces RestrictNetworkInterfaces RestrictRealtime RestrictSUIDSGID
    RootDirectory RootDirectoryStartOnly RootHash RootHashSignature RootImage RootImageOptions
    RootVerity RuntimeDirectory RuntimeDirectoryMode RuntimeDirectoryPreserve RuntimeMaxSec
    RuntimeRandomizedExtraSec SELinuxContext SecureBits SendSIGHUP SendSIGKILL SetCredential
    SetCredentialEncrypted Slice SmackProcessLabel SocketBindAllow SocketBindDeny Sockets StandardError
    StandardInput StandardInputData StandardInputText StandardOutput StartLimitAction StartLimitBurst
    StartLimitInterval StartupAllowedCPUs StartupAllowedMemoryNodes StartupBlockIOWeight
    StartupCPUShares StartupCPUWeight StartupIOWeight StateDirectory StateDirectoryMode
    SuccessExitStatus SupplementaryGroups SysVStartPriority SyslogFacility SyslogIdentifier SyslogLevel
    SyslogLevelPrefix SystemCallArchitectures SystemCallErrorNumber SystemCallFilter SystemCallLog
    TTYColumns TTYPath TTYReset TTYRows TTYVHangup TTYVTDisallocate TasksAccounting TasksMax
    TemporaryFileSystem TimeoutAbortSec TimeoutCleanSec TimeoutSec TimeoutStartFailureMode
    TimeoutStartSec TimeoutStopFailureMode TimeoutStopSec TimerSlackNSec Type UMask
    USBFunctionDescriptors USBFunctionStrings UnsetEnvironment User UtmpIdentifier UtmpMode WatchdogSec
    WatchdogSignal WorkingDirectory
    """.split()),
    "Install": frozenset("""
    Alias Also DefaultInstance RequiredBy WantedBy
    """.split()),
}
_COMMENT_AFTER_VALUE = re.compile(r"\s[#;]")
_FENCE = re.compile(r"^([ \t]*)```ini\n(.*?)^\1```", re.S | re.M)


def units_in_markdown(text: str) -> list[str]:
    """The ```ini blocks of a page (indented ones, in a list, too) that hold a unit: a [Unit],
    [Service] or [Install] line."""
    blocks = [textwrap.dedent(b) for _, b in _FENCE.findall(text)]
    return [b for b in blocks if re.search(r"^\[(Unit|Service|Install)\]\s*$", b, re.M)]


def parse(text: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> its values in order (continuation lines joined), comments dropped."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in _logical_lines(text):
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("[") and s.endswith("]"):
            section = s[1:-1]
            out.setdefault(section, {})
        elif section is not None and "=" in s:
            key, _, value = s.partition("=")
            out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def problems(text: str, source: str) -> list[str]:
    """What systemd would warn about and ignore, one line each ("SOURCE:LINE: what")."""
    found = []
    section = None
    for n, line in enumerate(_logical_lines(text), 1):
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        where = f"{source}:{n}"
        if s.startswith("["):
            section = s[1:-1] if s.endswith("]") else None
            if section not in KNOWN:
                found.append(f"{where}: unknown section {s}")
            continue
        if section is None:
            found.append(f"{where}: a line outside any section: {s}")
            continue
        if "=" not in s:
            found.append(f"{where}: not KEY=VALUE: {s}")
            continue
        key, _, value = s.partition("=")
        key = key.strip()
        if section in KNOWN and key not in KNOWN[section]:
            found.append(f"{where}: unknown key {key!r} in [{section}]")
        if _COMMENT_AFTER_VALUE.search(value):
            found.append(f"{where}: a comment after a value (systemd reads it as part of {key}'s value): {s}")
    return found


def _logical_lines(text: str) -> list[str]:
    """Lines with a trailing backslash joined to the next, kept one per physical line so that
    line numbers stay true (a joined line's continuation becomes an empty line)."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        if pending and line.lstrip().startswith(("#", ";")):
            out.append("")   # a comment inside a continued line is skipped
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            out.append("")
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out
