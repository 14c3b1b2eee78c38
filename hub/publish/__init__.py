"""Publishing: sign a whole publication once and lay out each cluster's branch files."""

from hub.publish.sign import ClusterPublication, Publication, PublicationSigner, sign_publication

__all__ = ["ClusterPublication", "Publication", "PublicationSigner", "sign_publication"]
