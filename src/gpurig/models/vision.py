"""Image models: classifiers for 3×224×224 ImageNet images (AlexNet, VGG-16, ResNet-50 and ResNet-152) and
SSD300, a detector for 3×300×300 images on a ResNet-50 backbone.

Written here from the papers and torchvision's published layouts (there is no
torchvision build for every machine gpurig runs on); the module paths match
torchvision's (``features.0``, ``layer1.0.conv1``, ``fc``), and so do the
parameter counts, which the tests check exactly.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn


def alexnet(classes: int = 1000) -> nn.Module:
    """AlexNet as torchvision builds it: one tower, 64-192-384-256-256 filters, no local response normalisation.

    This single-tower variant is the one torchvision cites from Krizhevsky's 2014
    "One weird trick for parallelizing convolutional neural networks", the paper
    that made convolutions data-parallel and the fully connected layers
    model-parallel; the 2012 network split every layer over two GPUs.

    >>> with torch.device("meta"):  # shapes only: no memory, no initialisation
    ...     model = alexnet()
    >>> sum(p.numel() for p in model.parameters())
    61100840
    """
    features = nn.Sequential(
        nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
    )
    return _features_and_head(features, 6, _classifier(256 * 6 * 6, classes, dropout_first=True))


# VGG configuration D (Simonyan & Zisserman 2015, table 1): channels, "M" = 2×2 max pooling.
_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(classes: int = 1000) -> nn.Module:
    """VGG-16 (configuration D, no batch normalisation): thirteen 3×3 convolutions and three dense layers.

    >>> with torch.device("meta"):  # shapes only: no memory, no initialisation
    ...     model = vgg16()
    >>> sum(p.numel() for p in model.parameters())
    138357544
    """
    layers: list[nn.Module] = []
    channels = 3
    for item in _VGG16:
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(channels, item, 3, padding=1), nn.ReLU(inplace=True)]
            channels = item
    return _features_and_head(nn.Sequential(*layers), 7, _classifier(512 * 7 * 7, classes, dropout_first=False))


def _features_and_head(features: nn.Module, pooled: int, classifier: nn.Module) -> nn.Sequential:
    """torchvision's ``features`` → ``avgpool`` (to pooled×pooled) → ``classifier``, under the same names."""
    return nn.Sequential(OrderedDict(features=features, avgpool=nn.AdaptiveAvgPool2d(pooled), flatten=nn.Flatten(),
                                     classifier=classifier))


def _classifier(features: int, classes: int, dropout_first: bool) -> nn.Sequential:
    """The 4096-4096 dense head AlexNet and VGG share (AlexNet puts dropout before each hidden layer, VGG after)."""
    def hidden(inputs: int) -> list[nn.Module]:
        pair = [nn.Linear(inputs, 4096), nn.ReLU(inplace=True)]
        return [nn.Dropout(0.5), *pair] if dropout_first else [*pair, nn.Dropout(0.5)]
    return nn.Sequential(*hidden(features), *hidden(4096), nn.Linear(4096, classes))


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1×1 reduce, 3×3 (carrying the stride, as in torchvision's "v1.5"), 1×1 expand ×4.

    ResNeXt's (Xie et al. 2017) splits the 3×3 into ``groups`` of ``base_width`` channels per 64 of the stage's;
    SE-ResNeXt's (Hu et al. 2018) reweights the output's channels by a squeeze-and-excitation gate.
    """

    expansion = 4

    def __init__(self, inputs: int, planes: int, stride: int = 1, groups: int = 1, base_width: int = 64,
                 se: bool = False):
        super().__init__()
        width = planes * base_width // 64 * groups
        outputs = planes * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, padding=1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, outputs, 1, bias=False), nn.BatchNorm2d(outputs)
        self.relu = nn.ReLU(inplace=True)
        self.se = SqueezeExcitation(outputs) if se else None
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                            nn.BatchNorm2d(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.se is not None:
            out = self.se(out)
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class SqueezeExcitation(nn.Module):
    """Channel gates from the global average: two 1×1 convolutions (reduction 16), ReLU then sigmoid."""

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, channels // reduction, 1)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(channels // reduction, channels, 1)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.relu(self.fc1(self.pool(x)))))


class ResNet(nn.Module):
    """A bottleneck ResNet (He et al. 2016) for 224×224 images; ``blocks`` per stage, e.g. (3, 4, 6, 3) for ResNet-50;
    ``groups``, ``base_width`` and ``se`` make it a ResNeXt or an SE-ResNeXt."""

    def __init__(self, blocks: tuple[int, int, int, int], classes: int = 1000, groups: int = 1, base_width: int = 64,
                 se: bool = False):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = 64
        for stage, (count, planes) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
            stride = 1 if stage == 1 else 2
            stage_blocks = []
            for index in range(count):
                stage_blocks.append(Bottleneck(channels, planes, stride if index == 0 else 1, groups, base_width, se))
                channels = planes * Bottleneck.expansion
            setattr(self, f"layer{stage}", nn.Sequential(*stage_blocks))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(classes: int = 1000) -> nn.Module:
    """ResNet-50: bottleneck blocks (3, 4, 6, 3).

    >>> with torch.device("meta"):  # shapes only: no memory, no initialisation
    ...     model = resnet50()
    >>> sum(p.numel() for p in model.parameters())
    25557032
    """
    return ResNet((3, 4, 6, 3), classes)


def resnext101(classes: int = 1000) -> nn.Module:
    """ResNeXt-101 32×4d: ResNet-101's blocks (3, 4, 23, 3), the 3×3 convolutions in 32 groups of 4 channels per 64.

    >>> with torch.device("meta"):
    ...     model = resnext101()
    >>> sum(p.numel() for p in model.parameters())
    44177704
    """
    return ResNet((3, 4, 23, 3), classes, groups=32, base_width=4)


def se_resnext101(classes: int = 1000) -> nn.Module:
    """SE-ResNeXt-101 32×4d: ResNeXt-101 32×4d with a squeeze-and-excitation gate in every block.

    >>> with torch.device("meta"):
    ...     model = se_resnext101()
    >>> sum(p.numel() for p in model.parameters())
    48955416
    """
    return ResNet((3, 4, 23, 3), classes, groups=32, base_width=4, se=True)


def resnet152(classes: int = 1000) -> nn.Module:
    """ResNet-152: bottleneck blocks (3, 8, 36, 3).

    >>> with torch.device("meta"):  # shapes only: no memory, no initialisation
    ...     model = resnet152()
    >>> sum(p.numel() for p in model.parameters())
    60192808
    """
    return ResNet((3, 8, 36, 3), classes)


class SSD300(nn.Module):
    """SSD300 with a ResNet-50 backbone, as NVIDIA's DeepLearningExamples train it (Liu et al. 2016, "v1.1").

    The backbone is ResNet-50 up to ``layer3``, whose stride is taken out so that
    a 300×300 image leaves it as 1024 × 38 × 38; five more blocks (1×1 then 3×3)
    shrink it to 19, 10, 5, 3 and 1; each of the six maps feeds a 3×3 box
    regressor and a 3×3 classifier over 81 COCO labels (4 or 6 default boxes per
    cell). The loss and the box matching are left out: they are a small part of a
    step, and the published throughputs time the network.
    """

    def __init__(self, labels: int = 81):
        super().__init__()
        self.labels = labels
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = 64
        for stage, (count, width, stride) in enumerate(((3, 64, 1), (4, 128, 2), (6, 256, 1)), start=1):
            blocks = []
            for index in range(count):
                blocks.append(Bottleneck(channels, width, stride if index == 0 else 1))
                channels = width * Bottleneck.expansion
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        maps = [1024, 512, 512, 256, 256, 256]
        extra = []
        for i, (inputs, outputs, width) in enumerate(zip(maps[:-1], maps[1:], (256, 256, 128, 128, 128))):
            shrink = dict(padding=1, stride=2) if i < 3 else {}
            extra.append(nn.Sequential(
                nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, outputs, 3, bias=False, **shrink), nn.BatchNorm2d(outputs), nn.ReLU(inplace=True)))
        self.additional_blocks = nn.ModuleList(extra)
        boxes = (4, 6, 6, 6, 4, 4)
        self.loc = nn.ModuleList(nn.Conv2d(c, n * 4, 3, padding=1) for c, n in zip(maps, boxes))
        self.conf = nn.ModuleList(nn.Conv2d(c, n * labels, 3, padding=1) for c, n in zip(maps, boxes))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        features = [self.layer3(self.layer2(self.layer1(x)))]
        for block in self.additional_blocks:
            features.append(block(features[-1]))
        batch = x.shape[0]
        locations = torch.cat([head(f).view(batch, 4, -1) for head, f in zip(self.loc, features)], 2)
        scores = torch.cat([head(f).view(batch, self.labels, -1) for head, f in zip(self.conf, features)], 2)
        return locations, scores


def ssd300(labels: int = 81) -> nn.Module:
    """SSD300 on a ResNet-50 backbone (NVIDIA DeepLearningExamples' PyTorch SSD): 8732 boxes per 300×300 image.

    >>> with torch.device("meta"):
    ...     locations, scores = ssd300()(torch.empty(2, 3, 300, 300))
    >>> locations.shape, scores.shape
    (torch.Size([2, 4, 8732]), torch.Size([2, 81, 8732]))
    """
    return SSD300(labels)
