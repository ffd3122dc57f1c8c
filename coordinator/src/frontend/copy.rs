//! COPY FROM STDIN: the client's CopyData pumped to the server.

use super::*;
use crate::net::tags;

impl Session {
    /// Forwards CopyData/CopyDone/CopyFail from the client until the copy ends.
    pub(super) async fn pump_copy_data(
        &mut self,
        connection: &mut ServerConnection,
        extended: bool,
    ) -> Result<(), RelayError> {
        loop {
            let (message, _) = self.read_message().await.map_err(RelayError::Client)?;
            let mut out = BytesMut::new();
            let last = match message {
                FrontendMessage::CopyData(data) => {
                    let at = protocol::begin_message(&mut out, tags::frontend::COPY_DATA);
                    out.put_slice(&data);
                    protocol::end_message(&mut out, at);
                    false
                }
                FrontendMessage::CopyDone => {
                    protocol::empty(&mut out, tags::frontend::COPY_DONE);
                    true
                }
                FrontendMessage::CopyFail(reason) => {
                    let at = protocol::begin_message(&mut out, tags::frontend::COPY_FAIL);
                    protocol::put_cstr(&mut out, &reason);
                    protocol::end_message(&mut out, at);
                    true
                }
                // Flush and Sync during COPY are ignored, as the server does.
                FrontendMessage::Flush | FrontendMessage::Sync => continue,
                FrontendMessage::Terminate => {
                    return Err(RelayError::Client(SessionError::ClientGone))
                }
                other => {
                    return Err(RelayError::Client(
                        protocol::ProtocolError::UnexpectedType(frontend_tag(&other) as char)
                            .into(),
                    ))
                }
            };
            if last && extended {
                // The Sync the client sends after the copy ends the batch.
                loop {
                    match self.read_message().await.map_err(RelayError::Client)?.0 {
                        FrontendMessage::Sync => break,
                        FrontendMessage::Flush => {}
                        other => {
                            return Err(RelayError::Client(
                                protocol::ProtocolError::UnexpectedType(
                                    frontend_tag(&other) as char
                                )
                                .into(),
                            ))
                        }
                    }
                }
                protocol::sync(&mut out);
            }
            connection.write(&out).await.map_err(RelayError::Server)?;
            if last {
                return Ok(());
            }
        }
    }
}
